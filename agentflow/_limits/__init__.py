"""Partner limits: whether a call may go now, the turns every gateway and model request takes."""
