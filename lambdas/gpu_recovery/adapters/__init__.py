"""Thin AWS adapters: the only modules that talk to boto3."""
