"""tcaudit: keep PyTorch training code on the GPU's Tensor Cores."""

__version__ = "0.1.0"

# The project's public repository, and the web address its docs/rules/ pages are served from (each
# rule's page is RULE_DOCS_URL/TCxxx.md). None until tcaudit is published: SARIF then leaves out
# ``informationUri`` and the rules' ``helpUri`` (the SARIF spec asks for absolute URIs in both, so a
# path relative to the repository would not do) and carries each rule's page in ``help.markdown``.
REPOSITORY_URL: str | None = None
RULE_DOCS_URL: str | None = None
