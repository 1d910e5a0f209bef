"""An app module that fails as it loads (its own bug): ``python -m durable run`` must say
so and exit 78, not crash into retries."""

raise RuntimeError("the app's module is broken")
