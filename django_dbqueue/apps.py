from django.apps import AppConfig


class DBQueueConfig(AppConfig):
    name = "django_dbqueue"
    label = "django_dbqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.utils.module_loading import autodiscover_modules

        from . import (
            checks,  # noqa: F401 - registers the system checks
            joblog,
        )

        joblog.connect()  # one INFO line per success, unless django_dbqueue.jobs is silenced

        autodiscover_modules("jobs")
        if self._uses_tasks_backend():
            from . import tasks  # noqa: F401 - registers the "django.tasks" job type

    @staticmethod
    def _uses_tasks_backend():
        import django
        from django.conf import settings

        tasks = getattr(settings, "TASKS", None) or {}
        return django.VERSION >= (6, 0) and any(
            isinstance(options, dict)
            and options.get("BACKEND") == "django_dbqueue.tasks.DBQueueBackend"
            for options in tasks.values()
        )
