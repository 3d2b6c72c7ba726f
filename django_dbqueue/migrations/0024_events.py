"""Publish and subscribe (docs/events.md): the ``dbqueue_event`` table and the job's ``event_id``.

``publish()`` inserts one event row and, in the same statement, one job per subscriber whose
``event_id`` names it. The column is nullable with no default, so a plain enqueue's INSERT
writes nothing more; its index is partial (only the jobs of events). No SQL function is
installed here.
"""

import django.db.models.deletion
import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0023_signals_at_commit"),
    ]

    operations = [
        migrations.CreateModel(
            name="Event",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "name",
                    models.CharField(
                        help_text="The event's name, e.g. invoice.paid.", max_length=200
                    ),
                ),
                ("payload", models.JSONField(blank=True, default=dict)),
                ("idempotency_key", models.CharField(blank=True, max_length=300, null=True)),
                (
                    "subscribers",
                    models.JSONField(
                        blank=True,
                        default=list,
                        help_text="The job types that got a job for this event.",
                    ),
                ),
                (
                    "published_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
            ],
            options={
                "verbose_name": "event",
                "db_table": "dbqueue_event",
                "ordering": ["-id"],
                "indexes": [
                    models.Index(fields=["published_at"], name="dbqueue_event_published_idx")
                ],
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("idempotency_key__isnull", False)),
                        fields=("name", "idempotency_key"),
                        name="dbqueue_event_key_uniq",
                    )
                ],
            },
        ),
        migrations.AddField(
            model_name="backgroundjob",
            name="event",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                db_index=False,
                editable=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="jobs",
                to="django_dbqueue.event",
            ),
        ),
        migrations.AddIndex(
            model_name="backgroundjob",
            index=models.Index(
                condition=models.Q(("event__isnull", False)),
                fields=["event"],
                name="dbqueue_job_event_idx",
            ),
        ),
    ]
