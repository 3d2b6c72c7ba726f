"""Fair shares between tenants (docs/fairness.md): the job's ``fair_key`` and the index the fair
claim walks (store/fair.py).

The column is nullable with no default, so an INSERT that does not name it (a plain enqueue of
a job without a key, ``dbqueue_enqueue()``, a publish) writes nothing more than before. The index
holds the pending jobs WITH a key only (``fair_key IS NOT NULL``): a plain job writes no entry
in it, and neither its claim nor its completion touches it. The fair claim finds a queue's
distinct keys by a skip scan over it (one probe per key) and, per key, its jobs in claim order.
enqueue() gives a fair queue's job without a key the shared key ''; a job with none at all
(NULL: SQL enqueue, publish) is found through the claim index instead. A claim moves a job out
of it (``running`` is outside the predicate), so the claim writes no entry. No SQL function is
installed here.

(Rewritten in place before any release: its first version indexed every pending job, keyed or
not, so that every plain enqueue wrote one more index entry.)
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_dbqueue", "0024_events"),
    ]

    operations = [
        migrations.AddField(
            model_name="backgroundjob",
            name="fair_key",
            field=models.CharField(blank=True, max_length=300, null=True),
        ),
        migrations.AddIndex(
            model_name="backgroundjob",
            index=models.Index(
                models.F("queue"),
                models.F("fair_key"),
                models.OrderBy(models.F("priority"), descending=True),
                models.F("run_after"),
                models.F("id"),
                condition=models.Q(("fair_key__isnull", False), ("state", "pending")),
                name="dbqueue_job_fair_idx",
            ),
        ),
    ]
