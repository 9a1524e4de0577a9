"""HTTP routes; each module owns one family of endpoints."""
