"""Kafka's transaction coordinator: transactional ids, their transactions and their __transaction_state records."""
