"""Partner limits, a feature beside the core (docs/partner-limits.md): `rules` decide (pure),
`store` keeps the rows and applies the rules under each partner's row lock, `limiter` takes a
turn around each partner call, `hooks` joins the sweeper's passes."""
