"""Quotas for teams: cluster queues, cohorts that nest, lending and borrowing, flavors.

Pure, no I/O. `model` holds the specs as plain values (built by the shell from the queue
objects), `tree` the cohort tree and the amounts each queue may use, `flavors` the choice of
a flavor per resource group and what it adds to the pods, `resolve` which cluster queue an
AppWrapper belongs to, `fairshare` the order of borrowers.
"""
