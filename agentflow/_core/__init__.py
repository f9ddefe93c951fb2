"""What the store and the features stand on: definitions, publishing, leases, crash points, a
database outage, what a call declares about people."""
