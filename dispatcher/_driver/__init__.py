"""The driver: one task per admitted call, and what a batch does around its calls.

Calls run attempt by attempt as the retry policy allows; around them, approvals, the session guard, events and
spans, and a fleet's coordination.
"""
