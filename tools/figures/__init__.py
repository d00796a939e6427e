"""attnlab's figures, one module per figure family (common.py: what they share)."""
