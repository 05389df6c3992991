"""Governance: money and budgets. Prices per provider and model, costs in exact pico-dollars,
budget periods on the UTC calendar. The limiter (gateway.ratelimit) enforces budgets beside the
rate limits, in the same admission; the runtime keys and teams and their spend live in the
limiter's backend (gateway.governance.store, gateway.governance.ledger)."""
