package postgres

// Internals under test from package postgres_test.
var (
	CheckVersion  = checkVersion
	VersionString = versionString
	ChannelOf     = channelOf
	IndexName     = indexName
	ArrayLiteral  = arrayLiteral

	WithBinaryParameters = withBinaryParameters
)
