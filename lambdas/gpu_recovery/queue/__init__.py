"""Job queue: submission API and scheduling."""
