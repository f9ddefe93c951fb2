"""Personal data sealed at rest and erasable per person (docs/privacy.md).

A workflow declares which fields of what its runs store are personal and whose they are
(`Personal`); those values are written as envelopes encrypted with a key per person (a
"subject key"), itself stored wrapped by a master key from settings. Destroying the subject
key erases that person from every run, every backup and every replica at once, while the rest
of the run (status, steps, amounts, partner references) stays readable.

Its modules are imported one by one (`envelope`, `scope`, `keystore`, ...): this package
imports nothing, so a definition may name `Personal` before Django's models are loaded.
"""

from __future__ import annotations
