# The sweeper's back-off (agentflow._sweeps.backoff): when it first re-published a run that no
# worker has answered since. A nullable column without a default: adding it rewrites nothing.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('agentflow', '0019_run_priority_and_concurrency_keys'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowrun',
            name='rung_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
