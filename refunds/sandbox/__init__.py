"""The partner sandbox: Stripe, airline, CRM and SMTP stand-ins sharing no code with clients."""

from __future__ import annotations
