"""What backups mean apart from any hypervisor: retention (which backups a
schedule keeps) and schedules (``backup schedule``)."""
