# The worker registry (presence.py, docs/operations.md#workers): a row per running worker
# process, written by that worker at its heartbeat and deleted at its clean stop or, once
# expired, by any worker's sweeper. No SQL function; nothing on a job's path reads the table.

from django.db import migrations, models

import django_dbqueue.models


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0016_claim_races"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkerRecord",
            fields=[
                ("worker_id", models.CharField(max_length=200, primary_key=True, serialize=False)),
                ("host", models.CharField(max_length=255)),
                ("pid", models.IntegerField()),
                ("version", models.CharField(max_length=50)),
                ("queues", django_dbqueue.models.TextArrayField(default=list)),
                ("concurrency", models.IntegerField()),
                (
                    "execution",
                    models.CharField(
                        help_text="Handlers run in threads or processes.", max_length=20
                    ),
                ),
                (
                    "group_pid",
                    models.IntegerField(
                        blank=True,
                        help_text="The run_jobqueue --processes parent, if any.",
                        null=True,
                    ),
                ),
                (
                    "state",
                    models.CharField(
                        choices=[("running", "running"), ("stopping", "stopping")], max_length=10
                    ),
                ),
                ("started_at", models.DateTimeField()),
                ("heartbeat_at", models.DateTimeField()),
                ("stale_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField()),
                (
                    "running",
                    models.IntegerField(default=0, help_text="Jobs held at the last heartbeat."),
                ),
            ],
            options={
                "verbose_name": "worker",
                "db_table": "dbqueue_worker",
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("state__in", ["running", "stopping"])),
                        name="dbqueue_worker_state_valid",
                    )
                ],
            },
        ),
    ]
