"""What the leader shows of its queues: the pending list, the aggregated visibility API, the web
view.
"""
