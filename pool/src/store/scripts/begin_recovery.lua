-- A node found Redis behind its replicas (Redis went back in time: a
-- restart from an older snapshot or AOF, a replica promoted with lost
-- writes): open the recovery window, as the first script after a data loss
-- does. Within it nothing new is admitted, and every worker re-asserts what
-- it runs; a key still running on a worker that has not re-asserted yet is
-- never admitted twice.
-- KEYS: base
-- ARGV: base, 4 worker ttl ms
-- Returns 'opened' | 'open' (a window is open already)
return open_recovery_window(tonumber(ARGV[4])) and 'opened' or 'open'
