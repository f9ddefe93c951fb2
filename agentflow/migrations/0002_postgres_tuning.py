from django.db import migrations


def tune_postgres(apps, schema_editor):
    """Postgres-only storage tuning for the run table, which every step updates.

    - Drop the varchar_pattern_ops index Postgres gets for a CharField key: nothing searches run
      ids with LIKE, and every non-HOT step update would pay for it.
    - Leave a fifth of each page free so step updates can be HOT (same page, no index writes).
    """
    if schema_editor.connection.vendor != "postgresql":
        return
    name = schema_editor._create_index_name("agentflow_workflowrun", ["id"], suffix="_like")
    schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")
    schema_editor.execute("ALTER TABLE agentflow_workflowrun SET (fillfactor = 80)")


class Migration(migrations.Migration):
    # Its own migration: the LIKE index is created by deferred SQL at the end of 0001.
    dependencies = [("agentflow", "0001_initial")]

    operations = [migrations.RunPython(tune_postgres, migrations.RunPython.noop)]
