"""Recording and guarding actions: the audit log, the permission guard every domain's views use,
the client address of a request, and the login limits (django-axes) with their pages."""
