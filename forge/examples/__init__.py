"""Example agents."""
