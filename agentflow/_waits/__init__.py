"""Waits: a step's timer, signal or approval settled before it runs."""
