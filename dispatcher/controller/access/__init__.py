"""Who may do what: the admission webhook's answers and the permission checks, the record
witness, the visibility API's reviews on their own budget, who may scrape /metrics."""
