# Cancelling a running job (docs/concepts/cancelling.md): when the cancel was asked for and
# by whom. Nullable columns without a default: PostgreSQL adds them to the catalog only, without
# rewriting the table. The CHECK scans the table once to validate (every existing row passes:
# the columns are NULL).

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("django_dbqueue", "0011_unique_and_serial"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="backgroundjob",
            options={
                "ordering": ["-id"],
                "permissions": [
                    ("requeue_backgroundjob", "Can requeue dead or cancelled jobs"),
                    ("run_now_backgroundjob", "Can make a scheduled job due now"),
                    ("cancel_backgroundjob", "Can cancel pending, waiting or running jobs"),
                ],
                "verbose_name": "background job",
            },
        ),
        migrations.AddField(
            model_name="backgroundjob",
            name="cancel_requested_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="backgroundjob",
            name="cancelled_by",
            field=models.CharField(blank=True, editable=False, max_length=200, null=True),
        ),
        migrations.AddConstraint(
            model_name="backgroundjob",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("cancel_requested_at__isnull", True),
                    ("state__in", ["running", "cancelled"]),
                    _connector="OR",
                ),
                name="dbqueue_job_cancel_mark_running",
            ),
        ),
    ]
