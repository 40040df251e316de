"""tierlog's own Kafka client: what the broker (to other brokers and the controller), the remote log metadata
manager, the Spark source, the CLI's probes and the tests send.

`requests` builds each request a tierlog component sends (pure functions returning kio request entities of
the version they are built for), `wire` turns a request into a frame and a response frame back into an
entity without doing any I/O, and `connection` carries them over a socket (framing, correlation ids,
timeouts). `probes` asks whether a Kafka broker answers at an address, with nothing but the wire format.
"""
