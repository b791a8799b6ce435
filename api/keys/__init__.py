"""The admin's API keys routes (/v1/admin/keys); the keys themselves are core/keys.py."""
