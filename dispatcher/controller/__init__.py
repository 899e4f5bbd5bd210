"""The controller: a manager wiring one owner per step of an AppWrapper's life — the
scheduler cache and scheduler (up to Dispatched), the reconciler (everything after, and the
wrapped objects), the status writer (every status write) and upkeep (stranded work, orphans).
"""
