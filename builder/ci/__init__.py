"""CI workflows rendered from the resolved plan (``python -m builder render --ci``)."""
