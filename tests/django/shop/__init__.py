"""A one-model app: receipts written by handlers through the ORM."""
