"""Optional apps that ship with agentflow; each is added to INSTALLED_APPS on its own."""
