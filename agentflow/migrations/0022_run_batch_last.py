# A batch's span as a field (agentflow.agent.steps): the last position of the calls running at
# once, `current_seq` being the first. Runs in flight said it only in `current_step` ("(calls
# 5-6 at once)"): their field is filled from that text here, once, so a batch begun before the
# deploy is still one after it. A nullable column without a default: adding it rewrites nothing.

import re

from django.db import migrations, models

_SPAN = re.compile(r"\(calls (\d+)-(\d+) at once\)")


def fill_batch_last(apps, schema_editor):
    WorkflowRun = apps.get_model("agentflow", "WorkflowRun")
    runs = WorkflowRun.objects.using(schema_editor.connection.alias).filter(
        current_step__startswith="(calls ", batch_last__isnull=True
    )
    for run_id, current_step in runs.values_list("id", "current_step").iterator():
        found = _SPAN.fullmatch(current_step)
        if found is not None:
            runs.filter(pk=run_id, current_step=current_step).update(
                batch_last=int(found.group(2))
            )


class Migration(migrations.Migration):

    dependencies = [
        ('agentflow', '0021_erasure_journal'),
    ]

    operations = [
        migrations.AddField(
            model_name='workflowrun',
            name='batch_last',
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(fill_batch_last, migrations.RunPython.noop, elidable=True),
    ]
