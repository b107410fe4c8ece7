module github.com/oncewal/oncewal

go 1.26
