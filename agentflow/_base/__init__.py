"""Pure values at the bottom: states, identifiers, the retry rule, the one "may have happened"
predicate, what a step sees."""
