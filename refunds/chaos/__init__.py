"""`manage.py chaos` (SPEC §7): refunds through the form while workers and the broker are killed.

`run.run(ChaosConfig(...))` does one run and returns its report; the modules split the work:
`processes` (broker, sandbox, beat), `traffic` (the customers), `kills` (the monkey),
`evidence` (what was left behind), `invariants` (SPEC §3.5) and `report` (the JSON).
"""
