"""Who is calling and what they may see: bearer tokens, the ACL chokepoint, the egress decision.

Modules and their public names:
- ``auth``: ``Principal``, ``TokenVerifier``, ``authenticate``, ``require_admin``, ``issue_token``.
- ``acl``: ``gate`` (every candidate passes it before any score, count or snippet leaves), ``pushdown``.
- ``egress``: which passages may be sent to an external generator.
"""
