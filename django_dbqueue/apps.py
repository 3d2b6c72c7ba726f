from django.apps import AppConfig


class DBQueueConfig(AppConfig):
    name = "django_dbqueue"
    label = "django_dbqueue"
    verbose_name = "Job queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self):
        from django.utils.module_loading import autodiscover_modules

        from . import checks  # noqa: F401 - registers the system checks

        autodiscover_modules("jobs")
