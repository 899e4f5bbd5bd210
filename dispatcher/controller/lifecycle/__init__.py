"""An AppWrapper's life after its admission: the reconciler and the parts it drives (making,
ending, resetting, progress, provisioning), upkeep, the ledger of lives.
"""
