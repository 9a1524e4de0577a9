"""`make bench`: headwise through HTTP against the limits it should approach, in one run."""
