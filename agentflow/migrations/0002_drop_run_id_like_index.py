from django.db import migrations


def drop_run_id_like_index(apps, schema_editor):
    """Postgres gets a varchar_pattern_ops index for a CharField key; nothing searches run ids
    with LIKE, and every step's run update would pay for it."""
    if schema_editor.connection.vendor != "postgresql":
        return
    name = schema_editor._create_index_name("agentflow_workflowrun", ["id"], suffix="_like")
    schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


class Migration(migrations.Migration):
    # Its own migration: the index is created by deferred SQL at the end of 0001.
    dependencies = [("agentflow", "0001_initial")]

    operations = [migrations.RunPython(drop_run_id_like_index, migrations.RunPython.noop)]
