/* nothing */
-- here
GO

