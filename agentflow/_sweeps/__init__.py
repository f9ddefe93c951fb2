"""The sweeper's policy, beside the sweeper: how long it leaves a run it re-published alone."""
