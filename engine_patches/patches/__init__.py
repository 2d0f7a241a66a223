"""One module per patch; each defines PATCH = registry.Patch(...)."""
