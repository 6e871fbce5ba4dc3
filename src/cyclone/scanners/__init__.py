"""Background passes that run inside every started client with handlers.

Each is safe with any number of clients at once: it selects rows to act on and changes
each with a CAS-guarded UPDATE, so two clients never apply the same change twice.
"""
