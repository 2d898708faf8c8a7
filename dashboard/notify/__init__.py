"""Notification channels (email, webhook) and the outbox that delivers alerts through them."""
