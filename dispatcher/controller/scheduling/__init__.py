"""Deciding what runs where: the scheduler cache, the scheduler, and the writer of why
work waits."""
