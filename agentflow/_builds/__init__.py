"""Builds and deploys: where a step goes and when it may start, the live workers of each build,
the rule for moving a run."""
