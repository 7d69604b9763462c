"""GPU training recovery: domain logic, repositories and AWS adapters."""
