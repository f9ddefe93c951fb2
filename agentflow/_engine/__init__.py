"""One step message carried out: the step task, its claimed attempts, the context it is given,
forks, system checks, the health and metrics views."""
