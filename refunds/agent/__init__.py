"""The refund as an agent (docs/refunds.md, `REFUNDS_ENGINE=agent`): tools, guardrails, prompt,
planner.

The same partner clients as the graph workflow, offered to a model as tools whose names and
parameters are an interface. What must hold whatever the model says (the fee, one charge, this
refund's booking only) is enforced in `guardrails`, by code.
"""
