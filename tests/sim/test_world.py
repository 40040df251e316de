"""The simulated world's rules: virtual time, node incarnations and pauses, and the network's faults."""

from __future__ import annotations

from tierlog.sim.world import Network, NetworkConditions, Node, Simulation


def world(**conditions: float) -> tuple[Simulation, Network, Node, Node]:
    sim = Simulation(seed=1, start_ms=0)
    network = Network(sim, NetworkConditions(min_delay_ms=1, max_delay_ms=5, **conditions))  # type: ignore[arg-type]
    a, b = Node(sim, "a"), Node(sim, "b")
    a.start()
    b.start()
    return sim, network, a, b


def test_events_run_in_time_order_and_ties_in_scheduling_order() -> None:
    sim = Simulation(seed=1, start_ms=0)
    ran: list[str] = []
    sim.after(10, lambda: ran.append("late"))
    sim.after(5, lambda: ran.append("first"))
    sim.after(5, lambda: ran.append("second"))
    sim.run_until(100)
    assert ran == ["first", "second", "late"]
    assert sim.now == 100


def test_a_crashed_nodes_timers_never_fire_even_after_a_restart() -> None:
    sim, _, a, _ = world()
    ran: list[str] = []
    a.after(10, lambda: ran.append("old incarnation"))
    a.crash()
    a.start()
    a.after(20, lambda: ran.append("new incarnation"))
    sim.run_until(100)
    assert ran == ["new incarnation"]


def test_a_paused_node_runs_what_reached_it_in_order_when_it_resumes() -> None:
    sim, _, a, _ = world()
    ran: list[int] = []
    a.after(5, lambda: ran.append(1))
    a.after(6, lambda: ran.append(2))
    a.pause()
    sim.run_until(50)
    assert ran == []
    a.resume()
    assert ran == [1, 2]


def test_a_cut_link_carries_nothing_in_its_direction_only() -> None:
    sim, network, a, b = world()
    got: list[str] = []
    network.cut_links([("a", "b")])
    network.send(a, b, lambda: got.append("a->b"))
    network.send(b, a, lambda: got.append("b->a"))
    sim.run_until(50)
    assert got == ["b->a"]
    network.restore_links([("a", "b")])
    network.send(a, b, lambda: got.append("a->b healed"))
    sim.run_until(100)
    assert got == ["b->a", "a->b healed"]


def test_overlapping_cuts_each_restore_only_their_own() -> None:
    sim, network, a, b = world()
    got: list[str] = []
    network.cut_links([("a", "b")])
    network.cut_links([("a", "b")])
    network.restore_links([("a", "b")])
    network.send(a, b, lambda: got.append("through"))
    sim.run_until(50)
    assert got == []


def test_a_message_in_flight_when_the_link_is_cut_is_lost() -> None:
    sim, network, a, b = world()
    got: list[str] = []
    network.send(a, b, lambda: got.append("arrived"))
    network.cut_links([("a", "b")])
    sim.run_until(50)
    assert got == [] and network.dropped == 1


def test_duplication_delivers_a_message_twice() -> None:
    sim, network, a, b = world(duplicate=1.0)
    got: list[str] = []
    network.send(a, b, lambda: got.append("copy"))
    sim.run_until(50)
    assert got == ["copy", "copy"]


def test_a_call_whose_reply_is_lost_fails_once_at_its_timeout() -> None:
    sim, network, a, b = world()
    outcomes: list[str] = []
    network.cut_links([("b", "a")])
    network.call(a, b, lambda respond: respond("pong"), outcomes.append, lambda: outcomes.append("timeout"), 100)
    sim.run_until(50)
    network.restore_links([("b", "a")])
    sim.run_until(500)
    assert outcomes == ["timeout"]


def test_a_reply_reaching_a_restarted_caller_is_ignored() -> None:
    sim, network, a, b = world()
    outcomes: list[str] = []
    network.call(a, b, lambda respond: sim.after(20, lambda: respond("late")), outcomes.append, lambda: None, 1000)
    sim.run_until(10)
    a.crash()
    a.start()
    sim.run_until(2000)
    assert outcomes == []


def test_a_request_reaching_a_restarted_target_is_lost() -> None:
    sim, network, a, b = world()
    handled: list[str] = []
    network.send(a, b, lambda: handled.append("handled"))
    b.crash()
    b.start()
    sim.run_until(50)
    assert handled == []
