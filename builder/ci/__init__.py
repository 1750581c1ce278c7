"""CI workflows rendered from the resolved plan (``python -m builder render --ci``)."""

#: How the emitted release is published on a tag (``render --ci ... --publish``), the default
#: first. ``trusted``: PyPI's trusted publishing (OIDC, no stored secret) of the wheels PyPI
#: takes (no local version). ``token``: ``publish`` with twine's variables, every wheel, to the
#: repository TWINE_REPOSITORY_URL names (the workflow as it was before trusted publishing).
PUBLISH_MODES = ("trusted", "token")
