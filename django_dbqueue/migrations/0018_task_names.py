# The failed attempts counted by the rollup and the dashboard (store.dashboard.FAILED_ATTEMPTS_SQL) read the
# pending rows with an error history through this index, instead of a scan of the job table.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_dbqueue', '0017_worker_registry'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='backgroundjob',
            index=models.Index(condition=models.Q(('state', 'pending'), models.Q(('errors', []), _negated=True)), fields=['run_after'], name='dbqueue_job_retried_idx'),
        ),
    ]
