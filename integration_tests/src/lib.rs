//! Process-level tests and the chaos suite of Flotilla.
