"""Recovery: the sweep that finds stuck, lost and due runs and moves them on."""
