"""`manage.py chaos` (docs/figures/chaos.md): refunds through the form while workers and the broker
are killed.

`run.run(ChaosConfig(...))` does one run and returns its report; the modules split the work:
`processes` (broker, sandbox, beat), `traffic` (the customers), `kills` (the monkey),
`evidence` (what was left behind), `invariants` (docs/protocol.md, "Invariants") and `report` (the
JSON).
"""
